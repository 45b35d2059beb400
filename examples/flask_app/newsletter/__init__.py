"""A newsletter on Flask whose welcome emails axa-queue sends."""
