-- Every advertised listener of every node (Kafka's advertised.listeners), so that Metadata,
-- FindCoordinator, DescribeCluster and the KIP-951 leader endpoints answer a client with the
-- endpoints of the listener its request came in on. `nodes.host`/`port` stay the
-- inter-broker listener's (what forwarding between nodes connects to). A node replaces its
-- rows once it registered, fenced by its node epoch (a second process refused the node id
-- never overwrites the live one's), with a change-log row that brings them to every view.

CREATE TABLE node_endpoints (
    node_id           integer NOT NULL,
    listener_name     text    NOT NULL,
    security_protocol text    NOT NULL,
    host              text    NOT NULL,
    port              integer NOT NULL,
    PRIMARY KEY (node_id, listener_name)
);

-- False (nothing written) unless p_epoch is the node's current, live registration.
CREATE FUNCTION mink_set_node_endpoints(p_node_id integer, p_epoch bigint, p_names text[],
                                        p_protocols text[], p_hosts text[],
                                        p_ports integer[]) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM nodes
      WHERE node_id = p_node_id AND epoch = p_epoch AND expires_at > now()
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM node_endpoints WHERE node_id = p_node_id;
    INSERT INTO node_endpoints (node_id, listener_name, security_protocol, host, port)
    SELECT p_node_id, e.name, e.protocol, e.host, e.port
      FROM unnest(p_names, p_protocols, p_hosts, p_ports) AS e(name, protocol, host, port);
    PERFORM mink_log_change('node_endpoints_changed',
                            jsonb_build_object('node_id', p_node_id, 'epoch', p_epoch));
    RETURN true;
END $$;
