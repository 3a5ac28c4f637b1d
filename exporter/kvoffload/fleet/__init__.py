"""A fleet read from Prometheus: the API client, the source, the runs, the summary and
`serve --prometheus`."""
