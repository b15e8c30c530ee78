"""Room for client quotas (round 2): byte-rate and request-time quotas per user and client
id, measured in windows, enforced with Kafka's throttle_time_ms. Empty until that work
lands."""
