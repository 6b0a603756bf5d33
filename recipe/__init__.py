"""Recipes on verl. `recipe.mrtpo` is the MRTPO recipe."""
