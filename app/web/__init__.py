"""The dashboard's HTTP side beside Streamlit's pages, mounted by app/server.py: the front door (front_door.py,
a middleware in front of every route) and the artifact downloads' route (downloads.py). The live charts' route
is app/live/route.py.

Nothing is imported here: app/server.py imports these modules before Streamlit's runtime exists, so they stay
torch-free and cache-free."""
