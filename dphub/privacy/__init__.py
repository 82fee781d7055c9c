"""dphub.privacy"""
