"""Test aids that ship with Mink (fault injection); only trio and the stdlib are imported here."""
