"""Topics: `config` holds the topic-level settings Kafka defines and the rules Mink applies
to them (validation, defaults, what Mink acts on); `changes` alters a live topic's settings;
`admin` creates and deletes topics and partitions (coordinator actions) and auto-creates
topics."""
