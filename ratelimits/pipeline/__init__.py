"""The request path: middleware and throttle -> evaluation -> resolver -> matching
-> the engine from `engines` -> responses and headers. Nothing here queries the database."""
