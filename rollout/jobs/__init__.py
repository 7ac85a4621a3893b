"""Jobs that write: options, preparing and running a job, its pool and attempts, regrade, the job lock, child services, Ray."""
