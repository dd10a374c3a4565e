"""What a run leaves as proof: the evidence document, the hash-chained audit trail, signed exports."""
