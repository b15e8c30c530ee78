"""The Kafka listener: `listener` accepts connections, `connection` applies each one's
requests in arrival order, `handlers/` has one module per Kafka API, `forwarding` sends
coordinator actions to the node that may carry them out."""
