"""The live dashboard (``GET /dashboard``): one static page that polls a JSON feed every second.

``watch.py`` samples the models' statistics only while a page is open; ``feed.py`` turns the service's state into
the feed; ``routes.py`` serves both, under the restricted-API rule; ``static/`` holds the page itself.
"""
