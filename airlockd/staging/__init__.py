"""The agent's private copy of the workspace: the stagers (mirror + overlay, or a full copy), the
mirrors and the keeper that refreshes them from file events, and the secret scanner."""
