"""The web console and the API's own documentation pages, served by the API process.

Everything the pages load is served from ``static/`` (the vendored Swagger UI and ReDoc
bundles under ``static/vendor/``, the console's stylesheet and its one script), so the
console and ``/docs`` work with no network beyond the API. See docs/console.md.
"""
