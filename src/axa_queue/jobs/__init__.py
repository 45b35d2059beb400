"""Jobs: what a new job is and what the queue tells of one (`model`), what arguments
may be (`arguments`), waiting for a job to finish (`waits`) and what queuing does in
the test and script modes (`modes`)."""
