"""The router: `glm-operator gateway --router`, in front of a service's pools (docs/routing.md)."""
