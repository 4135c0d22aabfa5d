"""Schedules: due times and daylight saving, the commands, the fire's exactly-once and overlap, the
workers' scheduler across kills and PostgreSQL restarts."""
