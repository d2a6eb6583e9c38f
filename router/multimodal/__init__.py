"""Images in prompts on the router's side: the limits they are checked against and their placeholders."""
