"""dphub.ensemble"""
