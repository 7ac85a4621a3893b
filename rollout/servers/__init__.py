"""The launcher's own HTTP servers: the feed, the viewer, ``serve``."""
