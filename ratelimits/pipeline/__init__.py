"""The request path: middleware and throttle -> evaluation -> resolver -> identity and paths
-> the engine from `store` -> responses and headers. Nothing here queries the database."""
