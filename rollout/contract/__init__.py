"""The in-sandbox contract: the start request/result types, the harness API and its runtime, the
forwarder. Standard library and pydantic only; bound read-only into every sandbox as one folder."""
