"""What a request is made of: the request, tiers, layouts and their rules, user-named paths."""
