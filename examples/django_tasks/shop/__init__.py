"""The shop: orders, and a task that sends each order's receipt."""
