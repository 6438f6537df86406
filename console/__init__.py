"""The web console: HTML pages and a JSON API over query nodes (rmqstore console)."""
