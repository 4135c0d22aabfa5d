"""The staff console and the app's pages: admin, dashboard, watch page, in Django's client and in Chromium."""
