"""OpenAI-compatible session gateway: forwards agent model calls to upstream routes, streams the
answers back and records every call as a step in the trajectory store (DESIGN.md sections 1, 4).

Entry point: ``python -m gateway --config configs/gateway.yaml``; app factory: ``gateway.app.create_app``.
"""
