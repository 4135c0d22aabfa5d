"""The suite's own machinery, tested: how bin/test's parallel workers share the tests out."""
