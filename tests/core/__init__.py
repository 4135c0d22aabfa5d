"""The run's core in process: models, the state machine, services and selectors, budgets, limits, retention."""
