"""dphub.hub"""
