"""The tests' app: tasks declared with Django's `@task`, and a view that queues one."""
