"""The S3 side of the export test, with boto3 (installed with moto).
Usage: s3.py ENDPOINT mkbucket BUCKET | s3.py ENDPOINT download BUCKET PREFIX DIR
     | s3.py ENDPOINT upload BUCKET KEY FILE
download writes every object under PREFIX/ to DIR/<key without PREFIX/> and prints the keys."""
import json
import os
import sys

import boto3

endpoint, command = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
if command == "mkbucket":
    s3.create_bucket(Bucket=sys.argv[3])
elif command == "download":
    bucket, prefix, out = sys.argv[3], sys.argv[4].rstrip("/") + "/", sys.argv[5]
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    for key in keys:
        path = os.path.join(out, key[len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, key, path)
    print(json.dumps(sorted(keys)))
elif command == "upload":
    s3.upload_file(sys.argv[5], sys.argv[3], sys.argv[4])
else:
    raise SystemExit(f"unknown command {command}")
