"""What the operator decides, from what it observed (pure: no kopf, no API client, no threads,
no sleeping; the time is an argument). controllers/ observes, calls these, and applies what
they return."""
