"""Decoder-only language models cut between their layers: greedy generation, serial or pipelined."""
