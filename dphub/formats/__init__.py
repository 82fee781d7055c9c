"""dphub.formats"""
