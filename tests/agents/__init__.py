"""Agents: the agent API, the built-in agents (demo, openai_chat) and what an agent may emit."""
