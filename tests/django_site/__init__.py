"""A small Django project the Django tests run: settings, an app with tasks (`shop`)."""
