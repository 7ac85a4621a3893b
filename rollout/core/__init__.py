"""The launcher's vocabulary: env configs and datasets, session ids, outcome classes, logging."""
