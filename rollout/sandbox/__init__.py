"""One attempt's process on one machine: the bubblewrap sandbox, cgroups, the runner, the gateway
bridge, the harness install cache. Never touches the store."""
