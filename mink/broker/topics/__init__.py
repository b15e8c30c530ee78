"""Topics: `config` holds the topic-level settings Kafka defines and the rules Mink applies
to them (validation, defaults, what Mink acts on)."""
