"""Reports: a sweep's runs as paper-shaped tables, plots, exports and significance statistics."""
