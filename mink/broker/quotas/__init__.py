"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546): byte-rate and request-time
quotas per user, per client id and per (user, client id), with defaults and Kafka's
precedence, measured in windows and enforced with `throttle_time_ms` and a muted connection.

- `entities.py`: entities, quota keys, the eight levels of precedence, request validation
  (pure).
- `rate.py`: Kafka's windowed Rate and the throttle time it gives (pure).
- `throttling.py`: which response versions the client throttles itself (KIP-219).
- `manager.py`: the node's quotas: loaded from PostgreSQL when the view moves, sensors per
  quota type, what a request is charged.
- `request_time.py`: the handler time a request costs (a trio instrument).
"""
