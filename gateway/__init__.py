"""OpenAI-compatible session gateway: forwards agent model calls to upstream routes, streams the
answers back and records every call as a step in the trajectory store (docs/architecture.md).

Three protocols share one forwarding and recording core (:mod:`gateway.forward`,
:mod:`gateway.relay`, :mod:`gateway.call`) and differ only in their adapter
(:mod:`gateway.protocols`): OpenAI chat completions, OpenAI Responses and Anthropic Messages.

Entry point: ``python -m gateway --config configs/gateway.yaml``; app factory: ``gateway.app.create_app``.
"""
