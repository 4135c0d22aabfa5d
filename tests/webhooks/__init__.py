"""Webhooks: endpoints, the outbox, delivery by workers, the address guard, per-user isolation and storage."""
