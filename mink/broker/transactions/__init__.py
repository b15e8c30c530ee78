"""Producers: `producer_ids` hands out producer ids in blocks (InitProducerId). The
transaction coordinator (a transactional id mapped to a partition of an internal topic,
state in PostgreSQL fenced by that partition's leader epoch; markers, LSO, aborted-
transaction index) will live here too."""
