"""Schedules: a job queued every interval or at a cron expression's times, each due
time once across replicas (`schedule`), and cron arithmetic (`cron`)."""
