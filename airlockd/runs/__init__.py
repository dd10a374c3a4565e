"""The run lifecycle: the Service (the facade both doors call), the one home of every state
transition (`lifecycle`), executing a run, review and commit, recovery, screening."""
