"""Handlers: the code that runs a job (`handler`), its retry policy (`policies`), the
arithmetic and failure text of retries (`retries`), and what a process has in code for
its queue (`registry`)."""
