"""The feed client for trainers under its public path (``from rollout.client import FeedClient``):
re-exports ``rollout.servers.feed.client``."""

from rollout.servers.feed.client import CursorFile, FeedClient, FeedError, FeedUnavailable

__all__ = ["CursorFile", "FeedClient", "FeedError", "FeedUnavailable"]
