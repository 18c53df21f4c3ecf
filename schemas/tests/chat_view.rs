//! `CallFinished::chat_view`: the one parse of a call's chat form.

use forgelog_schemas::testing::call_finished;

#[test]
fn the_chat_view_parses_messages_tools_and_answer_or_is_none() {
    let mut c = call_finished("r", "s", 0, 2, 1);
    c.chat_request =
        r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}"#.into();
    c.chat_response = r#"{"role":"assistant","content":"yo"}"#.into();
    let v = c.chat_view().unwrap();
    assert_eq!(v.messages.len(), 1);
    assert_eq!(v.tools.len(), 1);
    assert_eq!(v.answer.unwrap()["content"], "yo");
    c.chat_response = String::new();
    c.chat_request = r#"{"messages":[]}"#.into();
    let v = c.chat_view().unwrap();
    assert!(v.tools.is_empty() && v.answer.is_none());
    c.chat_request = String::new();
    assert_eq!(c.chat_view(), None);
}
