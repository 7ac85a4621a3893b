"""The vocabulary the gateway, the store and the launcher share: SSE, strict JSON and text, stream
assembly and answer reading, request models, step status, error bodies. Imports nothing of ours
(module map: docs/architecture.md)."""
