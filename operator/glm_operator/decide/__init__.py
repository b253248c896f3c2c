"""What the operator decides, from what it observed (pure: no kopf, no API calls, no clocks
read, no threads). controllers/ observes, calls these, and applies what they return."""
