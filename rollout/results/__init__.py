"""The read side: session records from the store, the results table and summary, progress."""
