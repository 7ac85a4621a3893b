"""Jobs that write: the job, the scheduler, regrade, the job lock, child services, Ray."""
