"""Worker processes: claims, attempts, leases, deaths, policies, the sweeper, faults, PostgreSQL restarts."""
