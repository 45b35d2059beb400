"""The seam that puts a statement on any kind of connection: `Call`s (`calls`), the
caller's connection of any library (`adapters`), this process's pools and connections
(`connector`, `pooler`), connections lent to the worker's loops (`lending`), and the
DSNs and URLs accepted (`dsns`). It imports no concept above it."""
