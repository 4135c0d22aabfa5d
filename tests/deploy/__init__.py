"""Installing and running it: package, host project, guides, production deploy, settings, processes, metrics."""
