"""The clients: the Python client and its CLI, the TypeScript client, its browser build and a generated client."""
